from django.urls import path

from budgets import views

urlpatterns = [
    path("", views.status),
    path("status/", views.status),
    path("jobs/<str:job>/", views.job),
    path("jobs/<str:job>/budget/", views.budget),
]

handler400 = views.bad_request
handler404 = views.not_found
handler500 = views.server_error
