"""Watch the agent: the demo and trajectory-viewer Serve app (``python -m workflows.demo``).

One Serve application with a FastAPI ingress, composed with the policy and analyzer
deployments (or attached to a running job's, ``demo.attach=true``), serving one static page:

- **Demo**: pick a task of the environment (or type an instruction), start an episode and watch
  it step by step: screenshot with the action drawn on it, the policy's response, the parsed
  action, the analyzer's judgment and step value, the served weight version. Step, run, pause,
  stop, temperature. Each episode's environment session is released on stop, when its page
  stops polling (closed) and after an idle timeout.
- **Trajectories**: browse ``runs/<run>/trajectories/**/*.parquet`` by run, policy version,
  group, episode and step, with screenshots, reward, advantage, d, v, guidance and the
  privileged-vs-ordinary log-prob gap; filter to failures or to steps where the gate fired.

Parts: :mod:`~workflows.demo.config` (settings, read from a job config such as
``embedded.yaml``), :mod:`~workflows.demo.live` (live episodes, no Ray),
:mod:`~workflows.demo.viewer` (Parquet reading, no Ray), :mod:`~workflows.demo.api` (the
FastAPI routes and their JSON errors), :mod:`~workflows.demo.app` (the Serve deployment and its
builder, ``serve run workflows.demo.app:build_app``), ``page.html`` (the page, plain HTML+JS).
"""
