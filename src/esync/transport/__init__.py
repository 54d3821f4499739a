"""Moving bytes between the nodes of a job: wire format, scheduler, node membership.

Knows nothing of models or algorithms (ps-lite's van and postoffice, in Python).
"""
