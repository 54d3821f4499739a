from django.db import migrations, models


class Migration(migrations.Migration):
    """A device's count of measured reports: its second measurement replaces its first,
    which is of its first local iteration, warm-up and all."""

    dependencies = [
        ('budgets', '0005_least_speed'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='measurements',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
