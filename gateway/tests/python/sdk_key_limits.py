"""The official SDK against a named key limited to one model and one request a minute (run by
`cargo test -p tela-gateway --test processes keys_have_limits_with_openai_rate_headers::`, which
sets the environment; not part of the main suite, whose key has no limits):

    TELA_BASE_URL         the gateway's OpenAI base URL
    TELA_LIMITED_API_KEY  a key allowed only TELA_MODEL, with rpm=1
    TELA_MODEL            the model it may use
    TELA_HIDDEN_MODEL     a model the nodes serve that the key may not use
"""

import os

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def limited():
    return openai.OpenAI(base_url=os.environ["TELA_BASE_URL"], api_key=os.environ["TELA_LIMITED_API_KEY"],
                         max_retries=0, timeout=60)


def not_found(client, model):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    assert e.value.code == "model_not_found"
    return e.value.response.json()["error"]


def test_a_hidden_model_is_not_found_like_an_unknown_one_and_not_listed(limited):
    hidden = os.environ["TELA_HIDDEN_MODEL"]
    as_hidden = str(not_found(limited, hidden)).replace(hidden, "MODEL")
    as_unknown = str(not_found(limited, "no-such-model")).replace("no-such-model", "MODEL")
    assert as_hidden == as_unknown
    assert hidden not in as_unknown
    assert [m.id for m in limited.models.list()] == [os.environ["TELA_MODEL"]]


def test_the_request_over_the_limit_is_a_rate_limit_error(limited):
    model = os.environ["TELA_MODEL"]
    raw = limited.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=4)
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-ratelimit-limit-requests"] == "1"
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    assert raw.headers["x-ratelimit-reset-requests"] == "1m0s"
    with pytest.raises(openai.RateLimitError) as e:
        limited.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    assert e.value.status_code == 429
    assert e.value.code == "rate_limit_exceeded"
    assert e.value.type == "requests"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    assert e.value.response.headers["x-ratelimit-remaining-requests"] == "0"
