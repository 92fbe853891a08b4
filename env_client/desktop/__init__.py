"""The desktop backend of the environment server: real X desktops behind the session protocol.

Parts (one code path for local desktops and remote OSWorld machines: both are driven through
OSWorld's in-VM HTTP API):

- ``config``: :class:`DesktopConfig` (pydantic only).
- ``program``: the pyautogui program text sent to ``/execute``, parsed back with the command
  whitelist (plus mouse/key down/up for ``computer_13``); ``computer13``: OSWorld's
  ``computer_13`` action dicts → the same operations.
- ``vmserver``: our in-desktop HTTP server (OSWorld's API subset) run on each local display;
  ``xinput``: operations → xdotool on that display. ``vmclient``: the client of that API.
- ``local``: one local desktop (session folder, Xvfb, window manager, in-desktop server) and its
  cleanup. ``backend``: :class:`DesktopBackend`, shaped like the MiniWoB browser the session
  manager drives.
- ``tasks``: task validation (setup steps, evaluator); ``setup``: the setup steps; ``getters``
  and ``metrics``: OSWorld's evaluator functions the built-in tasks use; ``evaluate``: the
  evaluator; ``experts``: the built-in task set and its scripted solutions.
"""
