from django.urls import path

from budgets import live, views

urlpatterns = [
    path("", views.status),
    path("status/", views.status),
    path("jobs/", live.jobs),
    # a browser's GET: the live page (budgets.live); the rest: the budget API
    path("jobs/<str:job>/", live.job),
    path("jobs/<str:job>/budget/", views.budget),
    path("jobs/<str:job>/report/", live.report),
    path("jobs/<str:job>/live/", live.live_json),
]

handler400 = views.bad_request
handler404 = views.not_found
handler500 = views.server_error
