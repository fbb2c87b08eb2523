"""A rank's weights drawn one tensor at a time (ShardedTransformer.drawn, what the sharded worker runs on every
rank that holds no reference) equal the shards of the whole model drawn at once, bit for bit, and own their
storage (a dim-0 block that stayed a view would keep the whole tensor alive)."""
import pytest
import torch

from kdbench.model.weights import init_weights, iter_weights
from kdbench.parallel.comm import Comm
from kdbench.parallel.model import ShardedTransformer
from kdbench.parallel.shard import shard_weights
from kdbench.references.model_config import get_preset


@pytest.mark.parametrize("parallel", ["tp", "ep"])
@pytest.mark.parametrize("rank", [0, 1])
def test_drawn_shards_equal_the_shards_of_the_whole_model(parallel, rank):
    cfg = get_preset("tiny")
    comm = Comm(rank, 2, torch.device("cpu"))
    drawn = ShardedTransformer.drawn(cfg, 7, comm, parallel, "cpu", torch.float32)
    whole = shard_weights(cfg, init_weights(cfg, 7, "cpu", torch.float32), rank, 2, parallel)
    assert drawn.w.keys() == whole.keys()
    for name, t in whole.items():
        assert torch.equal(drawn.w[name], t), name
    full = dict(iter_weights(cfg, 7, "cpu", torch.float32))
    split = [n for n in whole if whole[n].shape != full[n].shape]
    assert split, "nothing was split"
    for name in split:     # every split tensor is a copy of its own, not a view into the whole tensor
        assert drawn.w[name].untyped_storage().nbytes() == drawn.w[name].numel() * drawn.w[name].element_size(), name
