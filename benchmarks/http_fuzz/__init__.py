"""Bounded fuzzing of every HTTP surface we serve; ``benchmarks/fuzz_http.py`` is its command
line and says what a fuzz sends and checks.

    common           the probe, the bad bodies every surface gets, sending, judging, counting
    env_server       the environment server: probes, fuzzed session, health check, start-up
    openai_endpoint  the policy's OpenAI endpoint on Ray Serve: the same
    demo_app         the demo's FastAPI app: the same
    driver           drawing the probes over the surfaces and running one whole fuzz
"""
