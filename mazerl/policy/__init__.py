"""Policy runtime: model loading, prompt rendering, inference engines, the episode runner, the starter model."""
