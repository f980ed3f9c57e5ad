"""Recording a process that is already running: the attach itself, the background attach
the dashboard follows, and the list of processes one could attach to (secrets masked).
"""
