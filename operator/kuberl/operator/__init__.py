"""The kopf operator: an RLTrainingJob becomes a Ray head, rollout-worker and learner pods, and a status."""
