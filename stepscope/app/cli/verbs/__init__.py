"""The `stepscope` verbs, a module each (or one per family): ``register(sub)`` adds the
verb's parser and sets its ``func``, which ``main.py`` calls. Only arguments here: a
verb's command module (``cli/<verb>.py``) is imported inside ``func``, when the verb
runs, because it imports pandas, torch's collectors and the analyzers, and
`stepscope --help` should stay instant."""
