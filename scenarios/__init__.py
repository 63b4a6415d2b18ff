"""The scenario library: one file per scenario (see README "Adding a scenario")."""
