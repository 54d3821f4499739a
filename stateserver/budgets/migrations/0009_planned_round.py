from django.db import migrations, models


class Migration(migrations.Migration):
    """A job keeps the length of its latest round, fixed by the round's first request
    once every device has measured, and the ranks that train in it: every device of
    the round is given the same while they do
    (esync.algorithms.esync.budget.plan)."""

    dependencies = [
        ('budgets', '0008_times_reported'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='planned_round',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='job',
            name='planned_trainers',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.AddField(
            model_name='job',
            name='planned_seconds',
            field=models.FloatField(null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='planned_whole',
            field=models.BooleanField(default=False),
        ),
    ]
