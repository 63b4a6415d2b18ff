"""The scenario API, as scenario files import it: ``from harness.spec import Scenario, ...``.

The definitions live in ``harness.scenario``; this module is their one public face.
"""

from harness.scenario.spec import *  # noqa: F403
from harness.scenario.spec import __all__  # noqa: F401
