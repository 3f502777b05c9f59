"""The OpenAI SDK's other routes through a Tela gateway: Responses, an audio transcription (a
multipart upload) and image generation are forwarded like chat. The engine simulator answers
them; llama.cpp's server has none of them, so against it they are skipped."""

import pytest


@pytest.fixture
def sim_only(engine):
    if engine != "sim":
        pytest.skip("llama.cpp's server has no /v1/responses, audio or images routes")


def test_responses(client, model, sim_only):
    raw = client.responses.with_raw_response.create(model=model, input="Say hello in three words.", max_output_tokens=8)
    assert raw.headers.get("x-tela-node"), "the serving node is named"
    response = raw.parse()
    assert response.object == "response"
    assert response.output_text


def test_audio_transcription_is_a_multipart_upload(client, model, sim_only):
    audio = bytes(range(256)) * 16
    transcript = client.audio.transcriptions.create(model=model, file=("talk.wav", audio, "audio/wav"))
    assert transcript.text


def test_image_generation(client, model, sim_only):
    images = client.images.generate(model=model, prompt="a lighthouse at dusk", n=2)
    assert len(images.data) == 2
    assert all(image.b64_json for image in images.data)
