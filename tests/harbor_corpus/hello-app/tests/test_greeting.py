from pathlib import Path

GREETING = Path("/app/greeting.txt")


def test_the_file_is_there() -> None:
    assert GREETING.is_file()


def test_it_says_good_morning() -> None:
    assert GREETING.read_text().strip() == "Good morning, harbor."
