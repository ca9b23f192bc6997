"""mqstore_spark.cluster_round (make compose-check-spark's round larger than an executor): its keys have the
length asked for, filled with bytes a compressed shuffle cannot shrink, and a small round in local mode
(through a file:// tier, as compose runs it, its objects deleted at the end) runs both engines, finds their
files identical and reports what one executor would hold against its heap."""

from __future__ import annotations

import json
import math
import zlib

import pytest

from mqstore_spark import cluster_round
from mqstore_spark.datasource import read_segment

pytestmark = pytest.mark.slow


def test_keys_have_key_bytes_and_filler_that_does_not_compress_away():
    keys = [cluster_round.key_name(k, 256) for k in range(2_000)]
    assert {len(key) for key in keys} == {256} and len(set(keys)) == 2_000
    assert keys[7].startswith("key-0000000007") and " " not in keys[7]  # a space would end the first key
    assert cluster_round.key_name(7, cluster_round.KEY_PREFIX_BYTES) == "key-0000000007"  # the default: no filler
    raw = "".join(keys).encode()
    # hex filler: about half of it survives zlib (entropy coding); a run of one character would not
    assert len(zlib.compress(raw, 9)) > 0.4 * len(raw)


def test_generate_writes_every_key_at_its_length(tmp_path):
    queue_dir = tmp_path / "kv" / "0"
    size = cluster_round.generate(queue_dir, records=1_500, keys=1_000, segment_bytes=64 << 10, key_bytes=100)
    rows = [row for log in sorted(queue_dir.glob("*.log"))
            for row in read_segment(str(log), ("queue_offset", "key", "size"))]
    assert [row[0] for row in rows] == list(range(1_500))
    assert {len(row[1]) for row in rows} == {100} and len({row[1] for row in rows}) == 1_000
    assert sum(row[2] for row in rows) == size


def test_cgroup_cpu_reads_v1_nanoseconds_or_v2_usage_usec_and_none_without_a_counter(tmp_path):
    v1, v2 = tmp_path / "cpuacct.usage", tmp_path / "cpu.stat"
    v1.write_text("2500000000\n")
    v2.write_text("usage_usec 1750000\nuser_usec 1000000\nsystem_usec 750000\n")
    missing = str(tmp_path / "absent")
    assert cluster_round.cgroup_cpu_s((missing, str(v1), str(v2))) == 2.5
    assert cluster_round.cgroup_cpu_s((missing, str(v2), str(v1))) == 1.75
    assert cluster_round.cgroup_cpu_s((missing,)) is None


@pytest.mark.parametrize("argv,message", [(["--key-bytes", "13"], "--key-bytes must be in [14, 4096], not 13"),
                                          (["--executor-memory", "lots"], "a memory size such as 512m")])
def test_bad_arguments_are_refused_before_any_work(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cluster_round.main(["--dir", str(tmp_path / "round"), "--records", "10", "--keys", "5", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "round").exists()


def test_a_small_round_in_local_mode_is_identical_and_reports_keys_against_the_heap(tmp_path, capsys):
    """Through a file:// tier, as compose runs it (its workers do not mount the compactor's volume)."""
    tier = tmp_path / "tier"
    tier.mkdir()
    code = cluster_round.main(["--dir", str(tmp_path / "round"), "--records", "12000", "--keys", "8000",
                               "--key-bytes", "64", "--segment-mib", "1", "--master", "local[2]",
                               "--executor-memory", "128k", "--tier-url", f"file://{tier}"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and line["identical"] and line["differing"] == []
    assert line["tier_url"] == f"file://{tier}" and not [p for p in tier.rglob("*") if p.is_file()]
    assert (line["records"], line["keys"], line["key_bytes"]) == (12000, 8000, 64)
    assert line["keys_and_offsets_bytes"] == 8000 * (64 + 8) and line["executor_memory_bytes"] == 128 << 10
    assert line["keys_and_offsets_over_executor_memory"] == round(8000 * 72 / (128 << 10), 3)
    assert line["input_bytes"] > 1 << 20  # more than one segment of 1 MiB
    assert line["local_passes"] == math.ceil(1.25 * 12000 / 8001) and line["spark_s"] > 0  # buckets by records
    assert 0 < line["local_cpu_s"] and set(line) >= {"local_cgroup_cpu_s", "spark_cgroup_cpu_s"}
    assert not (tmp_path / "round").exists()  # the work directory goes at the end
