"""The federation under test comes from the environment, set by the Rust runner
(gateway/tests/processes/openai_sdk_end_to_end.rs) or by hand:

    TELA_BASE_URL         the gateway's OpenAI base URL, e.g. http://127.0.0.1:8080/v1
    TELA_API_KEY          a key the gateway accepts
    TELA_MODEL            the model the nodes serve
    TELA_ENGINE           "sim" (the built-in engine simulator) or "llama" (llama.cpp)
    TELA_NO_CAPACITY_URL  a gateway that knows the nodes but has no tunnel to any (503)
    TELA_MAX_BODY_BYTES   the first gateway's body limit (413 above it)
    TELA_MAX_CONCURRENT   the first gateway's concurrency limit (429 above it)
"""

import os

import openai
import pytest


def env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set; run this suite through `cargo test -p tela-gateway --test processes openai_sdk_end_to_end::`")
    return value


@pytest.fixture(scope="session")
def model():
    return env("TELA_MODEL")


@pytest.fixture(scope="session")
def engine():
    return os.environ.get("TELA_ENGINE", "sim")


@pytest.fixture(scope="session")
def client():
    # No SDK retries: each test sees exactly what the gateway answered.
    return openai.OpenAI(base_url=env("TELA_BASE_URL"), api_key=env("TELA_API_KEY"), max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def no_capacity_client():
    return openai.OpenAI(base_url=env("TELA_NO_CAPACITY_URL"), api_key=env("TELA_API_KEY"), max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def limits():
    return {"max_body": int(env("TELA_MAX_BODY_BYTES")), "max_concurrent": int(env("TELA_MAX_CONCURRENT"))}
