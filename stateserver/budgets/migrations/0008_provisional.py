from django.db import migrations, models


class Migration(migrations.Migration):
    """A time measured in a measuring round (one iteration, a warm-up the first time) is
    provisional: the device's next measurement replaces it."""

    dependencies = [
        ('budgets', '0007_remeasuring'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='provisional',
            field=models.BooleanField(default=False),
        ),
    ]
