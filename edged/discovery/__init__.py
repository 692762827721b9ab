"""Discovery: accelerators through udev (with hotplug), host facts and health through psutil.

Layers: ``hardware`` (pure data), ``classifying``, ``providers``, ``labelling`` and ``health``
(pure functions, tested as tables), ``udev`` and ``inventory`` (effects: pyudev, psutil),
``discovering`` (the edged component), ``doctor`` (the ``edged doctor`` report).
"""
