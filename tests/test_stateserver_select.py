"""budgets.database.select and count, the state server's hot reads written as SQL: the
rows and their order the ORM would give, in a real (SQLite) database."""
import pytest

pytestmark = pytest.mark.django_db


def test_select_gives_the_rows_the_orm_gives_in_order():
    from budgets.database import count, select
    from budgets.models import Device, Job

    one = Job.objects.create(name="one", num_workers=3, max_local_steps=8)
    other = Job.objects.create(name="other", num_workers=2, max_local_steps=8)
    for job in (one, other):  # ranks created out of order
        Device.objects.bulk_create(Device(job=job, rank=r, budget=10 * r + job.pk)
                                   for r in reversed(range(job.num_workers)))

    devices = select(Device, order_by="rank", lock=True, job_id=one.pk)
    assert [(d.rank, d.budget, d.job_id) for d in devices] == \
        list(Device.objects.filter(job=one).order_by("rank").values_list("rank", "budget",
                                                                          "job_id"))
    assert isinstance(devices[0], Device) and devices[0].pk is not None
    assert [j.name for j in select(Job, name="other")] == ["other"]
    assert select(Job, name="none") == []
    assert [d.rank for d in select(Device, job_id=other.pk, rank=1)] == [1]
    assert count(Device, job_id=one.pk) == 3 and count(Device, job_id=other.pk) == 2
    assert count(Device, job_id=one.pk, rank=7) == 0

    device = devices[1]  # an instance read so saves as the ORM's does
    device.budget = 99
    device.save(update_fields=["budget"])
    assert Device.objects.get(job=one, rank=1).budget == 99
    assert Device.objects.get(job=other, rank=1).budget != 99
