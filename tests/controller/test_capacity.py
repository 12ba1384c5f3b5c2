"""What each trainer rank asks Ray for and how many ranks a cluster's nodes hold: refusals that name the
resource or the rank count, computed from node resources alone (no Ray here; tests/cli/test_train_capacity.py
runs the same checks against a real cluster)."""

from __future__ import annotations

import math

import pytest

from rlckpt.controller.config import TrainConfig
from rlckpt.controller.ranks.capacity import (
    RANK_MEMORY_BYTES,
    check_capacity,
    check_rank_resources,
    rank_request,
    ranks_that_fit,
)
from rlckpt.errors import ClusterConfigError

GIB = float(1 << 30)


def node(**resources: float) -> dict[str, float]:
    return {"CPU": 4.0, "node:127.0.0.1": 1.0, **resources}


def test_every_rank_asks_for_memory_so_the_rank_count_is_bounded():
    assert rank_request(None) == {"memory": float(RANK_MEMORY_BYTES)}
    assert rank_request({"slot": 1.0}) == {"memory": float(RANK_MEMORY_BYTES), "slot": 1.0}


def test_a_node_holds_as_many_ranks_as_its_scarcest_resource_allows():
    request = {"memory": GIB, "slot": 1.0}
    assert ranks_that_fit([node(memory=8 * GIB, slot=3.0)], request) == 3
    assert ranks_that_fit([node(memory=2.5 * GIB, slot=3.0)], request) == 2


def test_ranks_do_not_span_nodes():
    request = {"memory": GIB}
    assert ranks_that_fit([node(memory=1.5 * GIB), node(memory=1.5 * GIB)], request) == 2  # not 3


def test_a_cluster_that_holds_the_ranks_passes():
    check_capacity([node(memory=4 * GIB, slot=1.0), node(memory=4 * GIB, slot=1.0)], 2, {"slot": 1.0})


def test_more_ranks_than_the_nodes_hold_are_refused_with_the_number_that_fits():
    expected = r"--trainer-ranks 100000: the Ray cluster \(1 node\) holds at most 8 trainer ranks"
    with pytest.raises(ClusterConfigError, match=expected):
        check_capacity([node(memory=4 * GIB)], 100000, None)


def test_a_resource_no_node_offers_is_named_with_what_they_offer():
    with pytest.raises(ClusterConfigError) as excinfo:
        check_capacity([node(memory=4 * GIB, slot=1.0)], 1, {"gpu_slot": 1.0})
    message = str(excinfo.value)
    assert "'gpu_slot', which no node of the Ray cluster offers" in message
    assert "CPU, memory, slot" in message and "node:" not in message


def test_a_resource_no_node_has_enough_of_for_one_rank_is_named():
    with pytest.raises(ClusterConfigError, match="2 'slot', and no node of the Ray cluster has more than 1"):
        check_capacity([node(memory=4 * GIB, slot=1.0)], 1, {"slot": 2.0})


def test_a_zero_amount_asks_for_nothing():
    check_capacity([node(memory=4 * GIB)], 1, {"absent": 0.0})


@pytest.mark.parametrize(
    ("resources", "cause"),
    [
        ({"CPU": 1}, "'CPU' is Ray's own resource"),
        ({"GPU": 1}, "'GPU' is Ray's own resource"),
        ({"x": math.inf}, "'x': inf is not an amount"),
        ({"x": math.nan}, "'x': nan is not an amount"),
        ({"x": -1}, "'x': -1 is not an amount"),
        ({"x": "1"}, "'x': '1' is not an amount"),
        ({"x": False}, "'x': False is not an amount"),
        ({"x": 1e-5}, "finer than Ray counts"),
        ({"": 1}, "is not a non-empty string"),
    ],
)
def test_resources_ray_would_refuse_are_refused_by_name(resources, cause):
    with pytest.raises(ClusterConfigError, match=cause):
        check_rank_resources(resources)


def test_the_train_config_refuses_them_too():
    with pytest.raises(ClusterConfigError, match="'CPU' is Ray's own resource"):
        TrainConfig(run_dir="/tmp/unused", trainer_resources={"CPU": 1.0})
