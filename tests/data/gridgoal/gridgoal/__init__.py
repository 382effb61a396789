"""GridGoal: importing the package registers `GridGoal-v0` with gymnasium, so a job may name it as
`gridgoal:GridGoal-v0` (gymnasium's `module:Env-vN`) as well as `gridgoal.envs:GridGoal` (module:Class)."""

import gymnasium as gym

gym.register(id="GridGoal-v0", entry_point="gridgoal.envs:GridGoal", max_episode_steps=50)
