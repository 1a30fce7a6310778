"""The vision-feature cache: each frame through the tower once, results independent of grouping."""

import numpy as np
import pytest
import torch

from envs.maze import MazeEnv
from mazerl.policy.chat import pixel_inputs
from mazerl.policy.loader import load_policy
from mazerl.policy.vision_cache import VisionCache, find_vision_tower


@pytest.fixture(scope="module")
def policy(starter_model_dir):
    torch.set_num_threads(2)
    return load_policy(starter_model_dir, device="cpu")


def frames(seeds):
    out = []
    for seed in seeds:
        frame, _ = MazeEnv(size=7, cell_px=16).reset(seed=seed)
        out.append(frame)
    return out


def encode(policy, cache, images):
    pixels = pixel_inputs(policy.processor, images)
    return find_vision_tower(policy.model)(pixels["pixel_values"], grid_thw=pixels["image_grid_thw"], return_dict=True)


def test_an_images_features_do_not_depend_on_what_it_was_encoded_with(policy):
    # given one frame encoded in a group with two others, and in another cache alone
    tower = find_vision_tower(policy.model)
    plain = tower.forward
    try:
        together = VisionCache(group_size=4)
        together.attach(policy.model)
        a = encode(policy, together, frames([5, 6, 7]))
        alone = VisionCache(group_size=4)
        alone.attach(policy.model)
        b = encode(policy, alone, frames([5]))
        # then its merged embedding and deepstack features are bit-identical
        tokens = b.pooler_output.shape[0]
        assert torch.equal(a.pooler_output[:tokens], b.pooler_output)
        assert all(torch.equal(x[:tokens], y) for x, y in zip(a.deepstack_features, b.deepstack_features, strict=True))
        # and a repeated frame is a hit, not a second encode
        encode(policy, alone, frames([5, 5, 8]))
        assert (alone.hits, alone.misses) == (2, 2)
    finally:
        tower.forward = plain
        tower.requires_grad_(True)


def test_cached_features_equal_the_towers_own(policy):
    tower = find_vision_tower(policy.model)
    images = frames(range(10))
    reference = encode(policy, None, images)
    plain = tower.forward
    try:
        VisionCache(group_size=8).attach(policy.model)
        cached = encode(policy, None, images)
    finally:
        tower.forward = plain
        tower.requires_grad_(True)
    assert torch.allclose(cached.pooler_output, reference.pooler_output, atol=1e-5)
    for x, y in zip(cached.deepstack_features, reference.deepstack_features, strict=True):
        assert torch.allclose(x, y, atol=1e-5)
    assert np.isfinite(cached.pooler_output.numpy()).all()
