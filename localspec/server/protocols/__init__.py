"""The protocols' routes and answers: llama.cpp (llamacpp.py, completion.py, editor.py), OpenAI (openai.py,
responses.py), Ollama (ollama.py), Anthropic (anthropic/); probs.py: log-probabilities in each one's shape."""
