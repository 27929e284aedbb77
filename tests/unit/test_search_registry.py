"""The search-method registry: a method is one spec, registered once; everything that lists or builds methods
reads it, options are validated by the method's own model, and mistakes are refused naming what is wrong."""

from __future__ import annotations

import json
import types
import typing
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from search_doubles import random_task

from shardwise.errors import ShardwiseError
from shardwise.profiling import MeasurementSettings
from shardwise.search import (
    GreedySearch,
    MethodError,
    MethodOptions,
    MethodSpec,
    NeuroShardSearch,
    NoOptions,
    Plan,
    PolicyError,
    Shard,
    get_method,
    load_policy_dir,
    make_searcher,
    method_names,
    register_method,
    unregister_method,
    validate_plan,
)

EXPECTED = ("neuroshard", "random", "size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy",
            "measured_greedy", "torchrec", "torchrec_cw", "torchrec_dp", "torchrec_rw", "dreamshard",
            "autoshard")


class RoundRobinOptions(MethodOptions):
    offset: int = Field(default=0, ge=0, description="device of the first table")


class RoundRobinSearch:
    """Table i on device (offset + i) mod devices: a method no one would ship, enough to see the plumbing."""

    name = "round_robin"

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def search(self, task, cost_model, seed):
        shards = tuple(Shard(table=t.name, col_offset=0, dim=t.dim, device=(self.offset + i) % task.num_devices)
                       for i, t in enumerate(task.tables))
        return Plan(num_devices=task.num_devices, shards=shards, method=self.name)


@pytest.fixture()
def round_robin():
    spec = register_method(MethodSpec(
        name="round_robin", factory=lambda options: RoundRobinSearch(options.offset), options=RoundRobinOptions,
        description="table i on device i mod devices",
    ))
    try:
        yield spec
    finally:
        unregister_method("round_robin")


def test_the_built_in_methods_are_registered_in_order():
    assert method_names() == EXPECTED


def test_a_method_registered_at_runtime_is_listed_and_built_with_validated_options(round_robin):
    assert method_names()[-1] == "round_robin" and get_method("round_robin") is round_robin
    task = random_task(0, 8, 4, memory_slack=4.0)
    plan = make_searcher("round_robin", offset=1).search(task, None, 0)
    validate_plan(plan, task)
    assert [s.device for s in plan.shards[:3]] == [1, 2, 3]
    with pytest.raises(MethodError, match="method 'round_robin': option 'offset': .*greater than or equal to 0"):
        make_searcher("round_robin", offset=-1)


def test_unregistering_removes_the_method(round_robin):
    unregister_method("round_robin")
    assert "round_robin" not in method_names()
    register_method(round_robin)  # the fixture unregisters it again


def test_a_duplicate_name_is_refused_unless_replaced_on_purpose(round_robin):
    with pytest.raises(MethodError, match="'round_robin' is already registered"):
        register_method(MethodSpec(name="round_robin", factory=lambda o: RoundRobinSearch(0), options=NoOptions,
                                   description="again"))
    with pytest.raises(MethodError, match="'size_greedy' is already registered"):
        register_method(get_method("size_greedy"))
    replacement = MethodSpec(name="round_robin", factory=lambda o: RoundRobinSearch(2), options=NoOptions,
                             description="replaced")
    register_method(replacement, replace=True)
    assert get_method("round_robin") is replacement and method_names()[-1] == "round_robin"


def test_an_unknown_method_is_refused_listing_the_registered_ones():
    with pytest.raises(MethodError, match="'best_greedy' is not registered; one of neuroshard, random, .*autoshard"):
        make_searcher("best_greedy")
    with pytest.raises(ShardwiseError):  # the CLI prints it as one line
        get_method("best_greedy")
    with pytest.raises(ValueError):  # and pydantic settings validators turn it into a field error
        get_method("best_greedy")


def test_bad_options_are_refused_naming_the_option():
    with pytest.raises(MethodError, match="method 'neuroshard': option 'beam_width': .*greater than or equal to 1"):
        make_searcher("neuroshard", beam_width=0)
    with pytest.raises(MethodError, match=r"'beam_widht' is not one of its options \(it takes: beam_width, "):
        make_searcher("neuroshard", beam_widht=3)
    with pytest.raises(MethodError, match=r"'samples' is not one of its options \(it takes: none\)"):
        make_searcher("size_greedy", samples=2)
    with pytest.raises(MethodError, match="option 'samples'"):
        make_searcher("dreamshard", samples=-1)


def test_options_reach_the_searcher():
    searcher = make_searcher("neuroshard", beam_width=4, max_depth=1, time_budget_s=0.5)
    assert isinstance(searcher, NeuroShardSearch)
    assert (searcher.config.beam_width, searcher.config.max_depth, searcher.config.time_budget_s) == (4, 1, 0.5)
    measured = make_searcher("measured_greedy", measurement=MeasurementSettings(device="cpu", batch_size=64))
    assert isinstance(measured, GreedySearch) and measured.name == "measured_greedy"
    assert measured.timings is not None and measured.timings.measurement.batch_size == 64


def _cli_representable(annotation: object) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and _cli_representable(args[0])
    return annotation in (int, float, str, bool) or typing.get_origin(annotation) is Literal


@pytest.mark.parametrize("name", EXPECTED)
def test_every_methods_options_become_cli_flags_or_are_filled_by_the_job(name):
    spec = get_method(name)
    assert spec.description and "\n" not in spec.description
    for field_name, field in spec.options.model_fields.items():
        if field.annotation is MeasurementSettings:
            assert spec.measures, (name, field_name)
            continue
        assert _cli_representable(field.annotation), (name, field_name, field.annotation)
        assert field.description, f"{name}: option {field_name!r} has no description (its --help text)"
    spec.options()  # every option has a default: `shardwise plan --method X` needs no method flags
    assert spec.needs_cost_model <= spec.learned  # a method that cannot search without a model learns from it


def test_specs_that_contradict_their_options_are_refused():
    with pytest.raises(MethodError, match="measures: its options need `measurement: MeasurementSettings`"):
        MethodSpec(name="x", factory=lambda o: RoundRobinSearch(0), options=NoOptions, description="x",
                   measures=True)
    with pytest.raises(MethodError, match="plans with a policy: its options need `policy"):
        MethodSpec(name="x", factory=lambda o: RoundRobinSearch(0), options=NoOptions, description="x",
                   policy=get_method("dreamshard").policy)
    with pytest.raises(MethodError, match="method name 'Round Robin'"):
        MethodSpec(name="Round Robin", factory=lambda o: RoundRobinSearch(0), options=NoOptions, description="x")

    class NotOptions:
        pass

    with pytest.raises(MethodError, match="options must be a pydantic model class"):
        MethodSpec(name="x", factory=lambda o: RoundRobinSearch(0), options=NotOptions,  # type: ignore[arg-type]
                   description="x")
    assert issubclass(NoOptions, BaseModel)


def test_load_policy_dir_refuses_a_method_without_a_policy(tmp_path):
    (tmp_path / "policy.json").write_text(json.dumps({"format": "shardwise.policy/v1", "method": "neuroshard",
                                                      "config": {}}))
    with pytest.raises(PolicyError, match="field 'method' is 'neuroshard', expected one of dreamshard, autoshard"):
        load_policy_dir(tmp_path)
    (tmp_path / "policy.json").write_text(json.dumps({"format": "shardwise.policy/v0", "method": "dreamshard"}))
    with pytest.raises(PolicyError, match="field 'format' must be 'shardwise.policy/v1'"):
        load_policy_dir(tmp_path)
