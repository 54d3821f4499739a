from django.db import migrations, models


class Migration(migrations.Migration):
    """A budget's round may measure speeds (with a least speed, until every device has
    measured): the device's delta then weighs nothing."""

    dependencies = [
        ('budgets', '0005_least_speed'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='measuring',
            field=models.BooleanField(default=False),
        ),
    ]
