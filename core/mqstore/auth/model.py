"""The access model's former place: it is mqstore.access now, below mqstore.meta, which stores its users,
keys and rules (here it made auth and meta import each other). This name stays for the callers outside
core (services, tests, bench) until they import mqstore.access; core imports mqstore.access.
"""

from mqstore.access import *  # noqa: F403
