"""Report formats of a judged run: JUnit XML, Markdown, HTML, JSON (render.py picks one)."""
