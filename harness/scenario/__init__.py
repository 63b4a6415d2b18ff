"""The scenario API (Scenario, Expect, Sharding, PublicApi) and finding scenario files."""
