"""Where every loop finds every other: URLs and ZeroMQ addresses derived from the one config tree.

`Config` inherits these, so a loop writes `cfg.engine_url`; the ports themselves are the config's keys (0: picked
by `clawr1 run`, see clawr1/ports.py)."""
from __future__ import annotations


class Addresses:
    """Derived addresses; mixed into `clawr1.config.Config`, whose sections (serve, judge, ...) they read."""

    @property
    def engine_url(self) -> str:
        return f"http://{self.serve.host}:{self.serve.port}"

    @property
    def engine_urls(self) -> list[str]:
        """Every engine the gateway routes to and the trainer updates: configured, or the run's own."""
        own = [self.engine_url] + [f"http://{self.serve.host}:{p}" for p in self.serve.extra_ports]
        return list(self.gateway.engine_urls) or own

    @property
    def teacher_engine_url(self) -> str:
        """Where the judge scores hint-enhanced prompts."""
        if self.judge.teacher in ("frozen", "lagged"):
            return self.judge.teacher_url or f"http://{self.serve.host}:{self.judge.teacher_port}"
        return self.engine_urls[0]

    @property
    def prm_url(self) -> str:
        """Where the llm judge asks for votes: the configured endpoint, the serving engine (judge.prm=policy), or
        the PRM engine the run starts."""
        if self.judge.llm_url:
            return self.judge.llm_url
        if self.judge.prm == "policy":
            return self.engine_urls[0]
        if not self.judge.prm_port:
            return ""
        base = f"http://{self.serve.host}:{self.judge.prm_port}"
        return base + "/v1" if self.judge.llm_api == "openai" else base

    @property
    def gateway_url(self) -> str:
        return f"http://{self.gateway.host}:{self.gateway.port}"

    @property
    def pool_samples_addr(self) -> str:
        return f"tcp://{self.pool.host}:{self.pool.samples_port}"

    @property
    def pool_batches_addr(self) -> str:
        return f"tcp://{self.pool.host}:{self.pool.batches_port}"

    @property
    def publish_addr(self) -> str:
        return f"tcp://{self.trainer.host}:{self.trainer.publish_port}"

    @property
    def judge_turns_addr(self) -> str:
        return f"tcp://{self.judge.host}:{self.judge.port}"

    @property
    def gateway_acks_addr(self) -> str:
        """Where the judge's acknowledgements reach the gateway (which binds it; 0.0.0.0 is reached on loopback)."""
        host = "127.0.0.1" if self.gateway.host in ("0.0.0.0", "") else self.gateway.host
        return f"tcp://{host}:{self.gateway.acks_port}"
