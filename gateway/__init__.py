"""Paternoster's HTTP gateway: a native job API and an OpenAI-compatible API over the job plane.

It imports the producer library only (no torch, no worker): a gateway runs beside web apps and
talks to workers through Redis like any other producer. ``paternoster gateway`` serves it;
``gateway.app.create_app`` builds the ASGI app. Nothing is imported here, so the CLI can
register the subcommand without loading FastAPI.
"""
