"""J with the expert-parallel dim named "ep", as expert-parallel stacks name it.

The model and sharding of ``j_clip_two_meshes`` on a ("dp", "ep") mesh: a stack's clipping
that finds expert parameters by the mesh dim name "ep" (one norm per group, then combined)
can be judged here; stock torch fails as in J.
"""

import dataclasses

from scenarios.j_clip_two_meshes import SCENARIO as J

SCENARIO = J.replace(sharding=dataclasses.replace(J.sharding, tp_dim="ep"))
