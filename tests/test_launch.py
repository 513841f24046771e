"""The one place that launches fairseq (fairseq_lnpos/launch.py): console scripts, the child's
environment, the training recipe and the configuration hash."""
import sys

from fairseq_lnpos import launch
from fairseq_lnpos.common import USER_DIR


def test_script_of_this_environment_else_from_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert launch.script("fairseq-train") == "fairseq-train"  # fairseq installed elsewhere: PATH finds it
    (tmp_path / "fairseq-train").write_text("")
    assert launch.script("fairseq-train") == str(tmp_path / "fairseq-train")
    assert launch.train_cmd("/d", "a", max_tokens=1)[0] == str(tmp_path / "fairseq-train")


def test_child_env_sets_threads_and_the_visible_gpu(monkeypatch):
    monkeypatch.setenv("LNPOS_PROBE", "kept")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = launch.child_env(3)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["LNPOS_PROBE"]) == ("3", "3", "kept")
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert launch.child_env(1, device=0)["CUDA_VISIBLE_DEVICES"] == "0"


def test_train_args_in_the_recipes_order():
    argv = launch.train_args("/d", "transformer_preln_tiny", max_tokens=512, task="translation_lnpos",
                             langs=("de", "en"), model=["--dropout", "0.1"], optim=launch.adam(1e-3),
                             budget=["--max-update", "5"], seed=2, save_dir="/s", log_format="json",
                             log_interval=10, extra=["--cpu"])
    assert argv == ["/d", "--user-dir", str(USER_DIR), "--task", "translation_lnpos", "--source-lang", "de",
                    "--target-lang", "en", "--arch", "transformer_preln_tiny", "--dropout", "0.1",
                    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.001",
                    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                    "--max-tokens", "512", "--max-update", "5", "--seed", "2", "--save-dir", "/s",
                    "--log-format", "json", "--log-interval", "10", "--cpu"]
    # no label smoothing given as None: fairseq's own criterion (cross_entropy), no flag at all
    plain = launch.train_args("/d", "a", max_tokens=1, label_smoothing=None)
    assert plain == ["/d", "--user-dir", str(USER_DIR), "--arch", "a", "--max-tokens", "1"]


def test_config_hash_is_the_one_run_folders_and_stages_were_stamped_with():
    config = {"run": {"name": "x", "lr": 0.0005}, "seed": 1, "data": "/d"}
    # sha256 of the key-sorted JSON, 16 hex digits: the hash written into existing run folders
    assert launch.config_hash(config) == "5105045bf94a7807"
    assert launch.config_hash(dict(reversed(config.items()))) == "5105045bf94a7807"
    assert launch.config_hash(dict(config, seed=2)) != "5105045bf94a7807"
    assert launch.config_hash({"p": USER_DIR}) == launch.config_hash({"p": str(USER_DIR)})  # paths as text
    assert len(launch.config_hash(config, 12)) == 12
