from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo's fixed data, `seed_demo`, and `simulate_agents`, which plays agent hosts.

    It may import every app; no app imports it. It has no models.
    """

    name = "demo"
