from django.db import migrations, models


class Migration(migrations.Migration):
    """A device that sits rounds out counts them, and measures its speed again after
    some of them."""

    dependencies = [
        ('budgets', '0006_measuring'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='rounds_out',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
