from django.db import migrations, models


class Migration(migrations.Migration):
    """--coordination-share: a job's share of a round its synchronisation may take, and
    what each device measured its synchronisation to cost."""

    dependencies = [
        ('budgets', '0003_live'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='coordination_share',
            field=models.FloatField(default=0.0),
        ),
        migrations.AddField(
            model_name='device',
            name='last_coordination',
            field=models.FloatField(null=True),
        ),
        migrations.AddField(
            model_name='device',
            name='smoothed_coordination',
            field=models.FloatField(null=True),
        ),
    ]
