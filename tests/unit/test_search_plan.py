import pytest

from shardwise.search import (
    Plan,
    PlanError,
    Shard,
    check_memory_bounds,
    load_plan,
    plan_memory_bytes,
    save_plan,
    validate_plan,
)
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

TABLES = (
    TableSpec(name="a", rows=1000, dim=16, pooling_factor=2.0),
    TableSpec(name="b", rows=2000, dim=32, pooling_factor=5.0),
    TableSpec(name="c", rows=500, dim=8, pooling_factor=1.0),
)


def task(memory_bytes: int = 2**30, num_devices: int = 2) -> ShardingTask:
    return ShardingTask(num_devices=num_devices, device_memory_bytes=memory_bytes, batch_size=256, tables=TABLES)


def plan(*shards: tuple[str, int, int, int], num_devices: int = 2) -> Plan:
    return Plan(num_devices=num_devices, shards=tuple(Shard(table=t, col_offset=o, dim=d, device=v) for t, o, d, v in shards))


GOOD = plan(("a", 0, 16, 0), ("b", 0, 16, 1), ("b", 16, 16, 0), ("c", 0, 8, 1))


def test_a_valid_plan_passes_and_its_memory_is_the_per_device_sum():
    validate_plan(GOOD, task())
    b = TABLES[1]
    expected = [
        shard_memory_bytes([TABLES[0], b.with_dim(16, "b[16:32]")], 256),
        shard_memory_bytes([b.with_dim(16, "b[0:16]"), TABLES[2]], 256),
    ]
    assert plan_memory_bytes(GOOD, task()) == expected


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (plan(("a", 0, 16, 0), ("b", 0, 32, 1), ("b", 16, 16, 0), ("c", 0, 8, 1)), "covered more than once"),
        (plan(("a", 0, 16, 0), ("b", 0, 16, 1), ("c", 0, 8, 1)), "columns 16..31 are not covered"),
        (plan(("a", 0, 16, 0), ("b", 0, 32, 1)), "table 'c' is not placed"),
        (plan(("a", 0, 16, 0), ("b", 0, 32, 2), ("c", 0, 8, 1)), "device 2 is out of range 0..1"),
        (plan(("a", 0, 16, 0), ("b", 0, 32, 1), ("c", 0, 8, 1), ("z", 0, 8, 1)), "no such table"),
        (plan(("a", 0, 6, 0), ("a", 6, 10, 1), ("b", 0, 32, 1), ("c", 0, 8, 1)), "not on a multiple of 4"),
        (plan(("a", 0, 16, 0), ("b", 0, 36, 1), ("c", 0, 8, 1)), "the table has dim 32"),
        (plan(("a", 0, 16, 0), ("b", 0, 32, 1), ("c", 0, 8, 0), num_devices=3), "num_devices 3"),
    ],
)
def test_invalid_plans_are_refused_naming_the_problem(bad, message):
    with pytest.raises(PlanError, match=message):
        validate_plan(bad, task())


def test_a_plan_over_a_device_memory_cap_is_refused_with_the_excess():
    cap = max(plan_memory_bytes(GOOD, task())) - 1
    with pytest.raises(PlanError, match=r"device \d needs .* GiB, over its cap .* by 0.000 GiB"):
        validate_plan(GOOD, task(memory_bytes=cap))


def test_memory_bounds_say_how_much_is_missing():
    total = shard_memory_bytes(TABLES, 256)
    with pytest.raises(PlanError, match=r"GiB missing"):
        check_memory_bounds(task(memory_bytes=total // 3), column_split=True)
    # b alone does not fit one device, but its halves do
    b_alone = shard_memory_bytes([TABLES[1]], 256)
    tight = task(memory_bytes=b_alone - 1)
    with pytest.raises(PlanError, match=r"table 'b': the table alone needs .* over the device cap"):
        check_memory_bounds(tight, column_split=False)
    check_memory_bounds(tight, column_split=True)


def test_plan_files_round_trip_with_extra_keys(tmp_path):
    annotated = GOOD.model_copy(update={"method": "handmade", "extra": {"memory_bytes": [1, 2]}})
    loaded = load_plan(save_plan(annotated, tmp_path / "plan.json"))
    assert loaded == annotated


@pytest.mark.parametrize("uri", ["s3://plans/plan.json", "runs:/0123/plan/plan.json"])
def test_a_plan_uri_of_no_registered_scheme_is_refused_in_one_line_naming_the_known_ones(uri):
    with pytest.raises(PlanError) as raised:
        load_plan(uri)
    scheme = uri.split(":", 1)[0]
    assert str(raised.value) == (f"{uri}: no reader of {scheme}:/ URIs (known: models:/); a plan is a "
                                 "shardwise.plan/v1 JSON file or a URI of those")


def test_a_file_path_is_read_as_a_file_where_it_holds_a_colon_or_a_drive_letter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "C:").mkdir()
    save_plan(GOOD, tmp_path / "C:" / "plan.json")
    assert load_plan("C:/plan.json") == GOOD  # one letter: a Windows drive, not a URI scheme
    with pytest.raises(PlanError, match=r"^/no/such:/plan.json: no such plan file$"):
        load_plan("/no/such:/plan.json")


def _plan_space_task(**plan_space: object) -> ShardingTask:
    """`task()` with table b (dim 32) given a plan space, validated as a task file's would be."""
    b = TableSpec.model_validate({**TABLES[1].model_dump(), **plan_space})
    return ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=256, tables=(TABLES[0], b, TABLES[2]))


WHOLE_B = plan(("a", 0, 16, 0), ("b", 0, 32, 1), ("c", 0, 8, 1))


@pytest.mark.parametrize(
    ("plan_space", "bad", "message"),
    [
        ({"sharding_types": ["table_wise"]}, GOOD,
         r"table 'b' is split into 2 column slices; its plan space \(sharding_types \['table_wise'\]\) does not "
         "allow column_wise"),
        ({"min_partition": 20}, GOOD, r"table 'b': column slice \[\d+:\d+\] is 16 columns, narrower than its "
                                      "min_partition 20"),
        ({"min_partition": 8}, plan(("a", 0, 16, 0), ("b", 0, 28, 1), ("b", 28, 4, 0), ("c", 0, 8, 1)),
         r"table 'b': column slice \[28:32\] is 4 columns, narrower than its min_partition 8"),
        ({"sharding_types": ["table_wise", "column_wise", "row_wise"]},
         Plan(num_devices=2, data_parallel=("b",), shards=WHOLE_B.shards[:1] + WHOLE_B.shards[2:]),
         r"data_parallel table 'b': its plan space \(sharding_types \['table_wise', 'column_wise', 'row_wise'\]\) "
         "does not allow data_parallel"),
        ({"sharding_types": ["column_wise", "data_parallel"], "min_partition": 16},
         Plan(num_devices=2, row_wise=("b",), shards=WHOLE_B.shards[:1] + WHOLE_B.shards[2:]),
         r"row_wise table 'b': its plan space \(sharding_types \['column_wise', 'data_parallel'\], min_partition 16\) "
         "does not allow row_wise"),
    ],
)
def test_plans_outside_a_tables_plan_space_are_refused_naming_it(plan_space, bad, message):
    validate_plan(bad, task())  # the same plan is valid where b has no plan space
    with pytest.raises(PlanError, match=message):
        validate_plan(bad, _plan_space_task(**plan_space))


def test_plans_inside_a_tables_plan_space_pass():
    validate_plan(WHOLE_B, _plan_space_task(sharding_types=["column_wise"], min_partition=64))  # whole: one shard
    validate_plan(GOOD, _plan_space_task(sharding_types=["column_wise"], min_partition=16))
    replicated = Plan(num_devices=2, data_parallel=("b",), shards=WHOLE_B.shards[:1] + WHOLE_B.shards[2:])
    validate_plan(replicated, _plan_space_task(sharding_types=["table_wise", "data_parallel"]))


def test_memory_bounds_consider_only_the_splits_a_tables_plan_space_allows():
    # b alone does not fit one device, its halves do: not where its plan space forbids halves
    cap = shard_memory_bytes([TABLES[1]], 256) - 1
    for plan_space in ({"sharding_types": ["table_wise", "row_wise"]}, {"min_partition": 20}):
        tight = _plan_space_task(**plan_space).model_copy(update={"device_memory_bytes": cap})
        with pytest.raises(PlanError, match=r"table 'b': the table alone needs .* over the device cap"):
            check_memory_bounds(tight, column_split=True)
    check_memory_bounds(_plan_space_task(min_partition=16).model_copy(update={"device_memory_bytes": cap}),
                        column_split=True)
    # a block of b's rows fits, where its plan space allows rows
    rows = _plan_space_task(sharding_types=["table_wise", "row_wise"]).model_copy(update={"device_memory_bytes": cap})
    check_memory_bounds(rows, column_split=False, row_wise=True)
    no_rows = _plan_space_task(sharding_types=["table_wise"]).model_copy(update={"device_memory_bytes": cap})
    with pytest.raises(PlanError, match="table 'b': the table alone needs"):
        check_memory_bounds(no_rows, column_split=True, row_wise=True)
