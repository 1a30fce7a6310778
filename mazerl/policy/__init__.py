"""Policy runtime: model loading (and the adapter checks), prompt rendering, inference engines, the episode runner."""
