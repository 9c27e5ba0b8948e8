"""The front desk's tools: what the agent can look up and change.

Tools check only that the data makes sense (known ids, a loan that belongs to the member) and raise
ValueError otherwise; tau2 turns that into an error message for the agent. The business rules (how often
a loan may be renewed, when a hold is allowed) are in policy.md on purpose: following them is what the
agent is graded on. The docstrings are the tool descriptions the agent reads. Results are short lines of
text rather than JSON: every token of them is in each later prompt.

No `from __future__ import annotations` here: tau2 builds each tool's schemas from its live type hints.
"""

from datetime import date, timedelta
from typing import TypeVar

from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool

from .data_model import Book, Hold, LibraryDB, Loan, Member

RENEWAL_DAYS = 14
Row = TypeVar("Row", Loan, Hold)


class LibraryTools(ToolKitBase):
    """Tools of the library's front desk."""

    db: LibraryDB  # set by ToolKitBase.__init__(db)

    def _member(self, member_id: str) -> Member:
        if member_id not in self.db.members:
            raise ValueError(f"Member {member_id} not found")
        return self.db.members[member_id]

    def _book(self, book_id: str) -> Book:
        if book_id not in self.db.books:
            raise ValueError(f"Book {book_id} not found")
        return self.db.books[book_id]

    def _owned(self, table: dict[str, Row], key: str, member_id: str, what: str) -> Row:
        """The member's own loan or hold `key`; ValueError for an unknown member, or a row not theirs."""
        self._member(member_id)
        row = table.get(key)
        if row is None or row.member_id != member_id:
            raise ValueError(f"{what} {key} not found for member {member_id}")
        return row

    def _next_hold_id(self) -> str:
        # Derived from the table, not from a counter or a uuid: replaying the same calls makes the same ids.
        highest = max((int(hold_id.removeprefix("H")) for hold_id in self.db.holds), default=0)
        return f"H{highest + 1:03d}"

    @is_tool(ToolType.READ)
    def get_member(self, email: str) -> str:
        """Find a member by the email on their account: their id, fines, loans and holds.

        Args:
            email: The member's email address.
        """
        member = next((m for m in self.db.members.values() if m.email.lower() == email.strip().lower()), None)
        if member is None:
            raise ValueError("No member with this email address")
        lines = [f"member {member.member_id}: {member.name}, fines owed {member.fines_owed:.2f}"]
        for loan in self.db.loans.values():
            if loan.member_id == member.member_id:
                title = self.db.books[loan.book_id].title
                others = sum(h.book_id == loan.book_id and h.member_id != member.member_id
                             for h in self.db.holds.values())
                lines.append(f"loan {loan.loan_id}: '{title}', due {loan.due_date}, renewals used "
                             f"{loan.renewals_used}, holds by others {others}")
        for hold in self.db.holds.values():
            if hold.member_id == member.member_id:
                lines.append(f"hold {hold.hold_id}: '{self.db.books[hold.book_id].title}'")
        return "\n".join(lines)

    @is_tool(ToolType.READ)
    def search_books(self, title: str) -> str:
        """Find books whose title contains the text, with the copies on the shelf now.

        Args:
            title: Part of the title.
        """
        needle = title.strip().lower()
        found = [f"book {b.book_id}: '{b.title}' by {b.author}, {b.copies_available} of {b.copies_total} "
                 "available" for b in self.db.books.values() if needle in b.title.lower()]
        return "\n".join(found) or "no book matches"

    @is_tool(ToolType.WRITE)
    def renew_loan(self, member_id: str, loan_id: str) -> str:
        """Renew a member's loan by 14 days.

        Args:
            member_id: The member id.
            loan_id: The loan id.
        """
        loan = self._owned(self.db.loans, loan_id, member_id, "Loan")
        loan.due_date = (date.fromisoformat(loan.due_date) + timedelta(days=RENEWAL_DAYS)).isoformat()
        loan.renewals_used += 1
        return f"loan {loan_id} renewed: due {loan.due_date}"

    @is_tool(ToolType.WRITE)
    def place_hold(self, member_id: str, book_id: str) -> str:
        """Place a hold for a member on a book.

        Args:
            member_id: The member id.
            book_id: The book id.
        """
        self._member(member_id)
        self._book(book_id)
        if any(h.member_id == member_id and h.book_id == book_id for h in self.db.holds.values()):
            raise ValueError(f"Member {member_id} already has a hold on book {book_id}")
        hold = Hold(hold_id=self._next_hold_id(), member_id=member_id, book_id=book_id)
        self.db.holds[hold.hold_id] = hold
        return f"hold {hold.hold_id} placed"

    @is_tool(ToolType.WRITE)
    def cancel_hold(self, member_id: str, hold_id: str) -> str:
        """Cancel one of a member's holds.

        Args:
            member_id: The member id.
            hold_id: The hold id.
        """
        self._owned(self.db.holds, hold_id, member_id, "Hold")
        del self.db.holds[hold_id]
        return f"hold {hold_id} cancelled"

    @is_tool(ToolType.GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the member to a human librarian, with a summary of their issue.

        Args:
            summary: The member's issue.
        """
        return "Transfer successful"
