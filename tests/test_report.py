"""The targets table of the Kernel engineering chapter judges each cell from the records."""
from elman import report


def _cell(impl, B, D, us):
    return {"impl": impl, "params": {"measure": "cell", "B": B, "D": D}, "metrics": {"per_step_us": us}}


def test_target_table_shows_a_near_miss_as_a_miss():
    recs = [_cell("cuda:persistent", 4, 1024, 1.0046), _cell("cuda:persistent", 4, 512, 0.85),
            _cell("cuda:steps+graph", 64, 2048, 7.7)]
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line
            for line in report.target_table(recs).splitlines()[2:]}
    near = rows[("forward per step (us)", "4", "1024")]
    assert "| 1.005 |" in near and near.rstrip(" |").endswith("| no | no")
    assert "| 0.850 | cuda:persistent | yes | no |" in rows[("forward per step (us)", "4", "512")]
    assert "cuda:steps+graph | no | no" in rows[("forward per step (us)", "64", "2048")]
    assert "not measured" in rows[("forward per step (us)", "16", "1024")]
