from django.db import migrations, models


class Migration(migrations.Migration):
    """--least-speed: the share of the fastest device's speed below which a device sits
    rounds out (budget 0)."""

    dependencies = [
        ('budgets', '0004_coordination'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='least_speed',
            field=models.FloatField(default=0.0),
        ),
    ]
