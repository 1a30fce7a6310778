"""The vision-feature cache: each frame through the tower once, results independent of grouping."""

import numpy as np
import pytest
import torch

from envs.maze import MazeEnv
from mazerl.policy.chat import pixel_inputs
from mazerl.policy.loader import load_policy
from mazerl.policy.vision_cache import VisionCache, distinct_frames, find_vision_tower


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


def test_distinct_frames_encode_each_image_once_with_the_towers_features_and_gradients(policy):
    # given a batch of five frames, three of them one frame, and a loss that weighs every token apart
    tower = find_vision_tower(policy.model)
    images = frames([5, 6, 5, 7, 5])
    pixels = pixel_inputs(policy.processor, images)

    def loss_and_gradients():
        tower.zero_grad(set_to_none=True)
        out = tower(pixels["pixel_values"], grid_thw=pixels["image_grid_thw"], return_dict=True)
        weights = torch.sin(torch.arange(out.pooler_output.numel(), dtype=torch.float32)).view_as(out.pooler_output)
        loss = (out.pooler_output * weights).sum() + sum((f * weights).sum() for f in out.deepstack_features)
        loss.backward()
        return out, {name: p.grad.clone() for name, p in tower.named_parameters()}

    tower.requires_grad_(True)
    reference, reference_grads = loss_and_gradients()
    encoded = []  # images per call of the tower's own forward

    def counting(hidden_states, grid_thw, **kwargs):
        encoded.append(len(grid_thw))
        return type(tower).forward(tower, hidden_states, grid_thw=grid_thw, **kwargs)

    tower.forward = counting
    try:
        # when the tower runs inside distinct_frames
        with distinct_frames(policy.model):
            deduplicated, grads = loss_and_gradients()
        # then it encoded the three distinct images once, in one call
        assert encoded == [3]
        assert tower.forward is counting, "the forward in place before comes back on exit"
    finally:
        del tower.forward
    # and every use got the tower's own features, and the gradients are the sums over the uses
    assert torch.allclose(deduplicated.pooler_output, reference.pooler_output, atol=1e-5)
    for x, y in zip(deduplicated.deepstack_features, reference.deepstack_features, strict=True):
        assert torch.allclose(x, y, atol=1e-5)
    for name, expected in reference_grads.items():
        assert torch.allclose(grads[name], expected, atol=1e-4, rtol=1e-4), name
    assert any(g.abs().max() > 1e-3 for g in reference_grads.values())
