"""scripts/host_facts.py, what every benchmark prints and stores beside its figures: the CPU's widest
vector ISA read from real /proc/cpuinfo flag lines, and each bench script using it."""

import glob
import json
import os
import subprocess
import sys

from support import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import host_facts  # noqa: E402

# flag lines of real CPUs, shortened to the flags that decide (and some that must not)
SAPPHIRE_RAPIDS = "fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8"
SKYLAKE_X = "fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl"
ZEN3 = "fpu sse4_2 avx avx2 fma f16c"
NEHALEM = "fpu sse4_1 sse4_2"


def test_the_widest_isa_is_read_from_the_flags():
    assert host_facts.isa_from_flags(set(SAPPHIRE_RAPIDS.split())) == "AMX"
    assert host_facts.isa_from_flags(set(SKYLAKE_X.split())) == "AVX-512"
    assert host_facts.isa_from_flags(set(ZEN3.split())) == "AVX2"
    assert host_facts.isa_from_flags(set(NEHALEM.split())) == "SSE4.2"
    assert host_facts.isa_from_flags(set()) == "unknown"
    assert host_facts.isa_from_flags({"avx512_bf16"}) == "unknown"  # a sub-flag alone names no level


def test_cpuinfo_is_read_from_the_first_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: {SAPPHIRE_RAPIDS}\n\n"
                    f"processor\t: 1\nmodel name\t: other\nflags\t\t: {NEHALEM}\n")
    model, flags = host_facts._cpuinfo(str(info))
    assert model == "Intel(R) Xeon(R) Platinum 8480+" and "amx_tile" in flags and host_facts.isa_from_flags(flags) == "AMX"
    assert host_facts._cpuinfo(str(tmp_path / "absent")) == ("", set())


def test_every_bench_script_prints_and_stores_the_host():
    scripts = sorted(glob.glob(os.path.join(ROOT, "scripts", "bench*.py")))
    assert len(scripts) >= 17
    for path in scripts:
        text = open(path).read()
        assert "host_facts.header()" in text and "host_facts.footer()" in text, path
        if "json.dump(" in text and "--json" in text:
            assert "host_facts.report()" in text, path


def test_a_bench_script_prints_the_host_and_its_cpu_time(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_tar_index.py"), "--help"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("# host: ") and " logical CPUs, " in run.stdout.split("\n")[0], run.stdout[:300]
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import host_facts; "
            "print(json.dumps(host_facts.report()))")
    report = json.loads(subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "scripts")], capture_output=True,
                                       text=True, check=True).stdout)
    assert report["isa"] in ("AMX", "AVX-512", "AVX2", "AVX", "SSE4.2", "unknown") and report["logical_cpus"] >= 1
    assert set(report["script"]) == {"wall_s", "cpu_s", "children_cpu_s", "cpu_over_wall"}
