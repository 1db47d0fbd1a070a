"""logging.report_to: the config key, and the W&B and MLflow sinks with the real packages offline.

W&B runs with WANDB_MODE=offline; the test reads the run file it writes (``run-<id>.wandb``: W&B's
record log, the leveldb log format holding protobuf records) back. MLflow writes to a file:// store
under tmp_path, read back with MlflowClient.
"""

import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accord.config import (
    ConfigError,
    LoggingConfig,
    config_from_dict,
    load_config,
    save_config,
)
from accord.tracking import SINKS, read_metrics
from accord.tracking.report_to import check_report_to
from accord.trainer import train

REPO = Path(__file__).resolve().parents[2]
HAS_WANDB = importlib.util.find_spec("wandb") is not None
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None and importlib.util.find_spec("pandas") is not None


# --------------------------------------------------------------------------- the config key


def test_report_to_defaults_to_tensorboard():
    assert LoggingConfig().report_to == ["tensorboard"]
    assert LoggingConfig(report_to="wandb").report_to == ["wandb"]
    assert LoggingConfig(report_to=[]).report_to == []


def test_tensorboard_flag_is_a_deprecated_alias(tmp_path, caplog):
    cfg = config_from_dict({"logging": {"tensorboard": False}})
    assert cfg.logging.report_to == [] and cfg.logging.tensorboard is None
    assert "logging.tensorboard=false is deprecated" in caplog.text
    cfg = config_from_dict({"logging": {"tensorboard": False, "report_to": ["tensorboard", "mlflow"]}})
    assert cfg.logging.report_to == ["mlflow"]
    cfg = config_from_dict({"logging": {"tensorboard": True, "report_to": ["wandb"]}})
    assert cfg.logging.report_to == ["wandb", "tensorboard"]
    save_config(cfg, tmp_path / "config.yaml")  # the saved config holds the resolved list only
    again = load_config(tmp_path / "config.yaml")
    assert again.logging.report_to == ["wandb", "tensorboard"] and again.logging.tensorboard is None


def test_report_to_bad_lists_are_config_errors():
    with pytest.raises(ConfigError, match="more than once"):
        config_from_dict({"logging": {"report_to": ["mlflow", "mlflow"]}})
    with pytest.raises(ConfigError, match="is not a sink name"):
        config_from_dict({"logging": {"report_to": [3]}})


def test_an_unknown_sink_is_one_line_naming_the_registered_ones_and_how_to_register():
    cfg = config_from_dict({"logging": {"report_to": ["wandbb"]}})   # a name registered later may be valid
    with pytest.raises(ConfigError) as err:
        check_report_to(cfg.logging.report_to)
    message = str(err.value)
    assert "\n" not in message
    assert "logging.report_to: 'wandbb' is not a registered sink; did you mean 'wandb'?" in message
    assert "registered: ['mlflow', 'tensorboard', 'wandb']" in message
    assert "accord.tracking.register_sink" in message and "imports:" in message
    with pytest.raises(ConfigError, match="'console' is not a sink of logging.report_to; set logging.console"):
        check_report_to(["console"])
    with pytest.raises(ConfigError, match="'jsonl' is not a sink of logging.report_to; RUN_DIR/metrics.jsonl"):
        check_report_to(["jsonl"])


def test_an_unknown_sink_stops_training_before_the_run_directory_is_made(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match="'nosuch' is not a registered sink"):
        train(config_from_dict(tiny_cfg(logging={"report_to": ["nosuch"]})))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_missing_tracker_package_is_a_one_line_error_before_models_load(tmp_path):
    """The package cannot be imported (None in sys.modules blocks an import): the CLI exits 2 with one line."""
    run_dir = tmp_path / "run"
    code = ("import sys; sys.modules['wandb'] = None; from accord.cli import main; "
            f"sys.exit(main(['train', {str(REPO / 'examples' / 'tiny.yaml')!r}, 'logging.report_to=[wandb]', "
            f"'run.run_dir={run_dir}']))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "pip install 'accord[wandb]'" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()  # nothing was built


# --------------------------------------------------------------------------- helpers


def _tracked_run(tiny_cfg, report_to, **logging):
    data = tiny_cfg(run={"steps": 2, "eval_after": True}, task={"name": "letters", "eval_size": 2},
                    logging={"report_to": report_to, "completions_every": 1, **logging})
    data["logging"].pop("tensorboard")  # the fixture's deprecated flag would remove tensorboard
    cfg = config_from_dict(data)
    run_dir = train(cfg)
    return cfg, run_dir, read_metrics(run_dir)


def _assert_same_metrics(expected: dict, got: dict, step: int):
    keys = set(expected) - {"step"}
    assert keys <= set(got), f"step {step}: missing {sorted(keys - set(got))}"
    for key in keys:
        want, have = float(expected[key]), float(got[key])
        assert (math.isnan(want) and math.isnan(have)) or have == pytest.approx(want, rel=1e-9, abs=1e-12), \
            f"step {step} {key}: {have} != {want}"


def _wandb_records(path: Path) -> list:
    """Records of a W&B run file: a 7-byte header, then 32 KiB blocks of chunks (crc32, uint16 length,
    type: 1 full, 2 first, 3 middle, 4 last) whose payloads are protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the next block
            pos += left
            continue
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
    return records


def _finished_wandb_records(path: Path, timeout: float = 60.0) -> list:
    """The run file's records once its last one (``exit``) is there: wandb's finish() returns when the
    W&B service has the run's end, and the service's writer flushes the file moments later."""
    deadline = time.monotonic() + timeout
    while True:
        records = _wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


# --------------------------------------------------------------------------- a sink of your own

_USER_SINK = """
from pathlib import Path

from accord.tracking import register_sink

BUILT = []


@register_sink("recorder")
class Recorder:
    @classmethod
    def from_run(cls, cfg, run_dir, *, start_step):
        sink = cls(cfg.run.name, Path(run_dir), start_step)
        BUILT.append(sink)
        return sink

    def __init__(self, name, run_dir, start_step):
        self.built_with = (name, run_dir, start_step)
        self.steps, self.tables, self.closed = {}, {}, False

    def log(self, step, metrics):
        self.steps[step] = dict(metrics)

    def log_completions(self, step, rows):
        self.tables[step] = list(rows)

    def close(self):
        self.closed = True
"""


@pytest.fixture
def user_sink_module(tmp_path, monkeypatch):
    """A module of the user's, listed under imports:, that registers the sink ``recorder``."""
    (tmp_path / "my_sinks.py").write_text(_USER_SINK)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_sinks"
    SINKS.pop("recorder", None)
    sys.modules.pop("my_sinks", None)


def test_a_registered_sink_named_in_report_to_receives_the_run(tiny_cfg, tmp_path, user_sink_module):
    data = tiny_cfg(run={"steps": 2, "eval_after": True}, task={"name": "letters", "eval_size": 2},
                    imports=[user_sink_module], logging={"report_to": ["recorder"], "completions_every": 1})
    data["logging"].pop("tensorboard")
    cfg = config_from_dict(data)
    run_dir = train(cfg)
    metrics = read_metrics(run_dir)
    (sink,) = sys.modules[user_sink_module].BUILT
    assert sink.built_with == (cfg.run.name, run_dir, 0) and sink.closed
    assert sorted(sink.steps) == [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        _assert_same_metrics(m, sink.steps[m["step"]], m["step"])
    assert "eval/team/reward" in sink.steps[2]
    for step in (1, 2):
        rows = [json.loads(line) for line in (run_dir / "completions" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert [r["completion"] for r in sink.tables[step]] == [r["completion"] for r in rows]
    assert not (run_dir / "tb").exists()  # only the sinks report_to names


# --------------------------------------------------------------------------- W&B


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install 'accord[wandb]')")
def test_wandb_offline_run_holds_the_metrics_config_and_completions(tiny_cfg, tmp_path, monkeypatch):
    for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg, run_dir, metrics = _tracked_run(tiny_cfg, ["wandb"], wandb_project="accord-test")
    assert [m["step"] for m in metrics] == [1, 2]
    assert not (run_dir / "tb").exists()  # report_to without tensorboard: no TensorBoard events

    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = _finished_wandb_records(run_file)
    (run_rec,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run_rec.display_name == cfg.run.name and run_rec.project == "accord-test"
    assert json.loads(run_dir.joinpath("trackers.json").read_text())["wandb"]["id"] == run_rec.run_id
    config = {item.key: json.loads(item.value_json) for item in run_rec.config.update}
    assert config["rollout"]["batch_size"] == 2 and config["logging"]["report_to"] == ["wandb"]
    assert config["policies"]["main"]["model"] == "tiny-qwen2"

    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            history[row["_step"]] = row
    assert sorted(history) == [1, 2]
    for m in metrics:
        _assert_same_metrics(m, history[m["step"]], m["step"])
    assert "eval/team/reward" in history[2]
    # the completions table of each step, as W&B wrote it next to the run file
    for step in (1, 2):
        table = json.loads((run_file.parent / "files" / history[step]["completions/path"]).read_text())
        rows = [json.loads(line) for line in (run_dir / "completions" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(table["data"]) == len(rows) == 2 * 4 * 2  # batch 2 x K 4 x 2 agents
        col = table["columns"]
        assert col[:3] == ["prompt", "agent", "completion"]
        assert [r[col.index("completion")] for r in table["data"]] == [r["completion"] for r in rows]
        assert [r[col.index("reward")] for r in table["data"]] == pytest.approx([r["reward"] for r in rows])


# --------------------------------------------------------------------------- MLflow


@pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow and pandas are not installed (pip install 'accord[mlflow]')")
def test_mlflow_file_store_holds_the_metrics_params_and_completions(tiny_cfg, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a file store
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = (tmp_path / "mlruns").as_uri()
    cfg, run_dir, metrics = _tracked_run(tiny_cfg, ["tensorboard", "mlflow"], mlflow_tracking_uri=uri,
                                         mlflow_experiment="accord-test")
    assert list((run_dir / "tb").iterdir())  # tensorboard still on

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("accord-test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == cfg.run.name and run.info.status == "FINISHED"
    assert json.loads(run_dir.joinpath("trackers.json").read_text())["mlflow"]["run_id"] == run.info.run_id
    params = run.data.params
    assert params["rollout.batch_size"] == "2" and params["policies.main.model"] == "tiny-qwen2"
    assert json.loads(params["logging.report_to"]) == ["tensorboard", "mlflow"]

    by_step: dict[int, dict] = {}
    for key in {k for m in metrics for k in m if k != "step"}:
        for point in client.get_metric_history(run.info.run_id, key):
            assert point.key not in by_step.setdefault(point.step, {}), f"{key} logged twice at step {point.step}"
            by_step[point.step][point.key] = point.value
    assert sorted(by_step) == [1, 2]
    for m in metrics:
        _assert_same_metrics(m, by_step[m["step"]], m["step"])

    files = {a.path for a in client.list_artifacts(run.info.run_id, "completions")}
    assert files == {"completions/step_000001.json", "completions/step_000002.json"}
    local = client.download_artifacts(run.info.run_id, "completions/step_000002.json", str(tmp_path / "dl"))
    table = json.loads(Path(local).read_text())  # log_table's format: pandas' "split" orient
    col = table["columns"]
    rows = [json.loads(line) for line in (run_dir / "completions" / "step_000002.jsonl").read_text().splitlines()]
    assert len(table["data"]) == len(rows) == 2 * 4 * 2  # batch 2 x K 4 x 2 agents
    assert [r[col.index("completion")] for r in table["data"]] == [r["completion"] for r in rows]
    assert [r[col.index("advantage")] for r in table["data"]] == pytest.approx([r["advantage"] for r in rows])
    tags = json.loads(run.data.tags["mlflow.loggedArtifacts"])  # what MLflow's UI lists as tables
    assert {"path": "completions/step_000002.json", "type": "table"} in tags


@pytest.mark.skipif(not (HAS_WANDB and HAS_MLFLOW), reason="needs wandb, mlflow and pandas (pip install "
                    "'accord[wandb,mlflow]')")
def test_resume_continues_the_tracker_runs(tiny_cfg, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from accord.trainer import Trainer

    for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = (tmp_path / "mlruns").as_uri()
    data = tiny_cfg(logging={"report_to": ["wandb", "mlflow"], "mlflow_tracking_uri": uri})
    data["logging"].pop("tensorboard")
    Trainer(config_from_dict(data)).train(stop_after=1)
    ids = json.loads((tmp_path / "run" / "trackers.json").read_text())
    Trainer(config_from_dict(data), resume=True).train()
    assert json.loads((tmp_path / "run" / "trackers.json").read_text()) == ids

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("accord").experiment_id])
    assert run.info.run_id == ids["mlflow"]["run_id"] and run.info.status == "FINISHED"
    assert [p.step for p in client.get_metric_history(run.info.run_id, "team/reward")] == [1, 2]

    run_files = sorted((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [p.name for p in run_files] == [f"run-{ids['wandb']['id']}.wandb"] * 2  # one W&B run, two processes
    steps = []
    for path in run_files:
        records = _finished_wandb_records(path)
        (run_rec,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run_rec.run_id == ids["wandb"]["id"]
        steps += [json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "history"
                  for i in r.history.item if list(i.nested_key) == ["_step"] or i.key == "_step"]
    assert steps == [1, 2]
