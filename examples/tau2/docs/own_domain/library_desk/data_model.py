"""The library's database: four tables keyed by id, as pydantic models (tau2 hashes them to grade a run).

The grader compares the database an agent leaves behind with the one the task's gold actions leave, so
everything that a correct or a wrong action changes must live here, and nothing that varies from run to
run (no clock, no random ids) may.
"""

from pydantic import BaseModel, Field
from tau2.environment.db import DB


class Member(BaseModel):
    member_id: str = Field(description="Unique id of the member, such as 'M001'")
    name: str = Field(description="Full name")
    email: str = Field(description="Email address on the account; the desk identifies members by it")
    fines_owed: float = Field(description="Unpaid fines in US dollars")


class Book(BaseModel):
    book_id: str = Field(description="Unique id of the title, such as 'B001'")
    title: str
    author: str
    copies_total: int = Field(description="Copies the library owns")
    copies_available: int = Field(description="Copies on the shelf now (not on loan)")


class Loan(BaseModel):
    loan_id: str = Field(description="Unique id of the loan, such as 'L001'")
    member_id: str
    book_id: str
    due_date: str = Field(description="Due date as YYYY-MM-DD")
    renewals_used: int = Field(description="How many times this loan has been renewed")


class Hold(BaseModel):
    hold_id: str = Field(description="Unique id of the hold, such as 'H001'")
    member_id: str
    book_id: str


class LibraryDB(DB):
    """Members, books, loans and holds of one library branch."""

    members: dict[str, Member] = Field(description="Members indexed by member id")
    books: dict[str, Book] = Field(description="Books indexed by book id")
    loans: dict[str, Loan] = Field(description="Current loans indexed by loan id")
    holds: dict[str, Hold] = Field(description="Current holds indexed by hold id")
