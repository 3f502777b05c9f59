"""The OpenAI SDK against a Tela gateway: every endpoint works as it does against OpenAI."""

import math

MESSAGES = [{"role": "user", "content": "Say hello in three words."}]


def test_models_lists_the_served_model(client, model):
    ids = [m.id for m in client.models.list()]
    assert model in ids
    assert client.models.retrieve(model).id == model


def test_chat_completion(client, model):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0)
    assert raw.headers.get("x-tela-node"), "the serving node is named"
    assert float(raw.headers["x-tela-gateway-ms"]) >= 0
    completion = raw.parse()
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_chat_completion_stream(client, model):
    parts = []
    chunks = 0
    with client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0, stream=True) as stream:
        for chunk in stream:
            chunks += 1
            assert chunk.object == "chat.completion.chunk"
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    assert chunks >= 2
    assert "".join(parts)


def test_completion(client, model):
    completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert completion.object == "text_completion"
    assert isinstance(completion.choices[0].text, str)


def test_completion_stream(client, model):
    texts = [c.choices[0].text for c in client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, stream=True) if c.choices]
    assert len(texts) >= 1
    assert "".join(texts)


def test_embeddings(client, model):
    result = client.embeddings.create(model=model, input=["first text", "second text"])
    assert len(result.data) == 2
    for item in result.data:
        assert len(item.embedding) > 0
        assert all(isinstance(x, float) and math.isfinite(x) for x in item.embedding)
