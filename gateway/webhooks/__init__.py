"""Webhook deliveries (issue 22): the deliverer behind ``paternoster webhooks``.

Scripts and workers queue one entry per job end (and start, if asked) on ``Keys.webhooks``;
deliverers read it through a consumer group, POST each delivery signed as Standard Webhooks
does, retry with backoff, and dead-letter what cannot be delivered. See docs/webhooks.md.
"""
