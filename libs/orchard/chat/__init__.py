"""Conversations and trajectories as text, in one place for every service and recipe: chat templates with tools
(templates), the one tool-call parser and tool schemas (tools), trajectories for a judge or a value model
(render), and the OpenAI message format (openai_format)."""
