"""fairseq-lnpos: Post-LN, Pre-LN, DeepNorm and Keel Transformers for fairseq (Xiong et al., ICML 2020)."""
from setuptools import find_packages, setup

setup(
    name="fairseq-lnpos",
    version="0.1.0",
    description="A fairseq --user-dir plugin to study LayerNorm position and learning-rate warm-up",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_lnpos", "fairseq_lnpos.*"]),
    package_data={"fairseq_lnpos.data": ["SHA256SUMS"]},
    install_requires=[
        # Upstream fairseq 0.12.2 does not import on Python >= 3.11 (dataclass defaults);
        # the fork fairseq-fixed provides the same `fairseq` package there.
        "fairseq>=0.12.2,<0.13; python_version < '3.11'",
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        # nn.LayerNorm(bias=False) (Keel) and forward pre-hooks with kwargs need torch 2.1
        "torch>=2.1",
        "sacrebleu>=2.0",
        "sentencepiece>=0.1.97",
        "sacremoses>=0.0.53",
        "tensorboard>=2.10",
        # fairseq logs "Please install tensorboardX" on every import without it, which would
        # precede every one-line error of the project's commands
        "tensorboardX>=2.5",
        "matplotlib>=3.5",
        # the table of every run and its views (analysis/frame.py); the verdicts' tests (analysis/verdict.py)
        "pandas>=1.5",
        "scipy>=1.7",
        # grid.sh slurm: job arrays, requeue and the task pickles (experiments/slurm.py uses its executor's
        # script writer for --dry-run)
        "submitit>=1.5,<2",
    ],
    extras_require={"test": ["pytest>=7"]},
    entry_points={
        "console_scripts": [
            # prints the folder to pass to fairseq's --user-dir after `pip install .`
            "fairseq-lnpos-userdir = fairseq_lnpos:print_user_dir",
        ]
    },
)
