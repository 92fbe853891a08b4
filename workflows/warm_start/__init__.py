"""The warm start (``python -m workflows.warm_start``): a tiny policy behaviour-cloned on scripted
demonstrations of the embedded tasks (``demos``, ``bc``), checked for success and guidance use
(``check``), and the GUI analyzer trained from it by the analyzer pipeline (``pipeline``),
built once and cached (``build``); ``warm:<seed>`` model paths name it."""
