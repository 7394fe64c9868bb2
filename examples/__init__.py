"""Sample workflows and tools.

``examples.hello`` is the small run ``manage.py durable_demo`` starts. The reference
agents (``examples.support``, ``examples.invoice``, ``examples.procurement``) run against
the services in this package -- a scripted OpenAI-compatible LLM (``fake_llm``), a
payments service with Stripe's idempotency contract (``payments_service``) and an SMTP
sink (``smtp_sink``) -- and are what ``make up``'s live demo (``demo``) and the chaos
audit (``chaos``) run.
"""
