"""``fnrt simulate``: list options take commas or a repeated flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main


def test_a_written_trace_replays_with_listed_policies_and_keep_alives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    days = tmp_path / "days"
    made = ["simulate", "--synthetic", "20", "--days", "2", "--write", str(days)]
    assert main([*made, "--policy", "fixed", "--keep-alive-min", "5"]) == 0
    assert "wrote 2 day files" in capsys.readouterr().err
    first, second = sorted(str(p) for p in days.iterdir())
    as_commas = ["--trace", f"{first},{second}", "--policy", "fixed,auto"]
    repeated = ["--trace", first, "--trace", second, "--policy", "fixed", "--policy", "auto"]
    tables = []
    for given in (as_commas, repeated):
        assert main(["simulate", *given, "--keep-alive-min", "5,10"]) == 0
        out = capsys.readouterr().out
        rows = [line.split()[0:3] for line in out.splitlines()[1:4]]
        assert rows == [["fixed", "5", "min"], ["fixed", "10", "min"], ["auto", *rows[2][1:]]]
        assert "20 functions x 2,880 minutes, 3 runs" in out
        tables.append(out.split("\n\n")[0])
    assert tables[0] == tables[1]


def test_a_bad_list_item_is_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--synthetic", "5", "--nodes", "4,x"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--nodes': 'x' is not a valid integer range" in err
    assert main(["simulate", "--policy", "fixed,sometimes", "--synthetic", "5"]) == 2
    assert "'sometimes' is not one of" in capsys.readouterr().err
    assert main(["simulate", "--trace", "/no/such/day.csv"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_auto_runs_once_per_price_and_plots_its_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["simulate", "--synthetic", "30", "--days", "2", "--policy", "fixed,auto"]
    assert main([*base, "--price-gb-s", "1000,20000"]) == 0
    rows = {line.split("  ")[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert {"auto 1,000 GB·s", "auto 20,000 GB·s"} <= set(rows)
    # a dearer cold start: fewer of them, more memory held idle
    cheap, dear = rows["auto 1,000 GB·s"], rows["auto 20,000 GB·s"]
    assert float(dear[3]) <= float(cheap[3]) and float(dear[6].replace(",", "")) >= float(
        cheap[6].replace(",", "")
    )
    png = tmp_path / "curve.png"
    assert main([*base, "--plot", str(png)]) == 0  # five prices by default with --plot
    out = capsys.readouterr().out
    assert out.count("auto ") == 5 and png.stat().st_size > 10_000
    assert main([*base, "--price-gb-s", "-5"]) == 2
    assert "Invalid value for '--price-gb-s'" in capsys.readouterr().err


def test_node_memory_compares_every_policy_at_each_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["simulate", "--synthetic", "40", "--days", "1", "--seed", "3"]
    png = tmp_path / "node.png"
    assert main([*base, "--node-memory-gb", "50%,100%", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[1:15]]
    policies = ["floor", "auto", "auto_plan", "auto_fill", "fixed", "greedy_dual", "lru"]
    assert [r[1] for r in rows] == policies * 2
    for first in (0, 7):  # no policy below the floor
        assert all(int(r[2].replace(",", "")) >= int(rows[first][2]) for r in rows[first:][:7])
    assert "fixed 10 minutes' peak with no budget" in out and png.stat().st_size > 10_000
    assert main([*base, "--node-memory-gb", "2.5"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "2.5"
    assert main([*base, "--node-memory-gb", "lots"]) == 1
    assert "'lots' is not a number of GB or a share" in capsys.readouterr().err
