"""From results to what trainers consume: training sequences, TRL and OpenEnv rows, export, attribution."""
