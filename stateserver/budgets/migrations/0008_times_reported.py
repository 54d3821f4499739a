from django.db import migrations, models


class Migration(migrations.Migration):
    """A device counts the times it reported (not null, interim ones not counted): one
    that sat out on its first alone, a warm-up, measures again soon
    (esync.algorithms.esync.budget.remeasures)."""

    dependencies = [
        ('budgets', '0007_remeasuring'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='times_reported',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
